"""Packaging: environment.yml mirrors pyproject.toml; the lock pins every dependency; CI runs the README command."""
import re
import subprocess
import sys
import tomllib

import yaml

from helpers import REPO
from largeprompt.io.pipeline import code_params

CONDA_NAMES = {"torch": "pytorch"}


def _split(requirement):
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement)
    return m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = dict(_split(r) for r in project["dependencies"] + project["optional-dependencies"]["test"])
    wanted = {CONDA_NAMES.get(k, k): v for k, v in wanted.items()}
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str) and not dep.startswith(("python", "pip")):
            name, spec = _split(dep)
            conda[name] = spec
    assert conda == wanted
    assert "python=3.11" in env["dependencies"]


def test_lock_pins_every_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"unpinned line in requirements.lock: {line}"
            pins[name.lower().replace("_", "-")] = version
    for dep in project["dependencies"]:
        assert _split(dep)[0] in pins, f"{dep} is not pinned in requirements.lock"


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    test_cmd = next(c for c in commands if "pytest" in c and "venv" in c)
    assert test_cmd.strip() in ci


def test_code_fingerprints_ignore_comments_and_docstrings_but_not_code(tmp_path):
    def code_fingerprint(path):
        """The fingerprint a rule running the script ``path`` records in its params (one script, no library code)."""
        script = path.parent / path.stem / "script.py"  # the same script name: only the code may differ
        script.parent.mkdir()
        script.write_text(path.read_text())
        (setting,) = code_params(script).values()
        return setting.value

    a = tmp_path / "a.py"
    a.write_text('"""Doc."""\nimport math\n\n\ndef f(x):\n    """Doc."""\n    return math.sqrt(x)  # root\n')
    b = tmp_path / "b.py"
    b.write_text('"""Another doc."""\nimport math\n\n# a comment\ndef f(x):\n    return math.sqrt(x)\n')
    c = tmp_path / "c.py"
    c.write_text('"""Doc."""\nimport math\n\n\ndef f(x):\n    """Doc."""\n    return math.sqrt(x) + 0\n')
    assert code_fingerprint(a) == code_fingerprint(b) != code_fingerprint(c)


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "workflow/scripts"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
