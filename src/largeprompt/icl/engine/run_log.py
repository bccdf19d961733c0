"""The training job's log: one line per run saying where it ended and what the summary will call it
(docs/experiments.md#run-status). Only printed: plumbing, left out of the rules' code fingerprints
(largeprompt.io.fingerprints.PLUMBING)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from largeprompt.icl.engine.status import change_window, final_change, final_loss, judge, readout, status_rule
from largeprompt.icl.test_set import linear_optimum_errors, load_test_set


def report_runs(frame: pd.DataFrame, flow_classes: dict[int, str], rule: dict | None, test_frame, L: int, task) -> None:
    """One log line per run: where it ended and, with the summary's status rule (``rule``: config ``train.trapped_*``;
    None for no verdict), what the summary will call it, with the class of its seed's flow."""
    window = change_window(rule or {})
    runs = pd.DataFrame([{"model": m, "seed": s, "stream": j, "time": g["time"].iloc[-1], "step": g["step"].iloc[-1],
                          "final_test_loss": final_loss(g["time"], g["test_loss"]),
                          "final_change": final_change(g["time"], g["test_loss"], window),
                          "readout": float(readout(g["u_y"].iloc[-1], g["norm_U_xx"].iloc[-1])),
                          "diverged": bool((g["status"] == "diverged").any())}
                         for (m, s, j), g in frame.groupby(["model", "seed", "stream"])])
    if rule is not None and flow_classes:
        floor = float(linear_optimum_errors(task, load_test_set(test_frame, L), L).mean())  # R(Γ*), as the summary
        runs = pd.concat([g.join(judge(g, status_rule(rule, m),
                                       floor if m == "linear" else np.inf)) for m, g in runs.groupby("model")])
    for r in runs.itertuples():
        verdict = "diverged" if r.diverged else getattr(r, "status", "")
        if getattr(r, "trap_reason", None):
            verdict = f"counted as trapped ({r.trap_reason}: {r.final_test_loss / r.reference_loss:.2f} × the reference)"
        elif verdict == "unconverged":
            verdict = f"counted as unconverged (its test loss moved {100 * r.final_change:.1f}% over the last {window:.0%} of its time)"
        kind = f"; its flow {flow_classes[r.seed]}" if r.seed in flow_classes else ""
        print(f"{r.model:8s} seed={r.seed} stream={r.stream}: t={r.time:.4g} step {r.step} final test {r.final_test_loss:.5f}"
              f" {verdict}{kind}")
