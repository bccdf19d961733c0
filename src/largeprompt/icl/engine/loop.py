"""The training loop of one prompt length: all runs, stacked, with logging, divergence and checkpoints
(docs/experiments.md#training-protocol; the pieces are in :mod:`largeprompt.icl.engine.runs`)."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import torch

from largeprompt.core.devices import DTYPES
from largeprompt.icl.engine import stacked, tuning
from largeprompt.icl.engine.runs import RunSpec, TrainingDiverged, initial_parameters, log_row, test_losses, whitened_batch
from largeprompt.icl.task import RegressionTask


class PromptLengthTrainer:
    """SGD of every run in ``specs`` at ``prompt_length``; ``step_sizes[r]`` is run r's lr sequence."""

    def __init__(self, task: RegressionTask, specs: list[RunSpec], step_sizes: list[np.ndarray], *, prompt_length: int,
                 base_seed: int, batch_size: int, n_log: int, divergence_threshold: float, dtype: str = "float32",
                 device="cpu", limits: dict | None = None):
        self.task, self.specs, self.L, self.device = task, specs, int(prompt_length), device
        self.base_seed, self.batch_size, self.threshold = int(base_seed), int(batch_size), float(divergence_threshold)
        self.dtype = DTYPES[dtype]
        self.step_sizes = [np.asarray(s, dtype=np.float64) for s in step_sizes]
        self.clocks = [np.concatenate([[0.0], np.cumsum(s)]) for s in self.step_sizes]  # t_k, k = 0…K_r
        self.horizon = max(float(c[-1]) for c in self.clocks)
        self.n_log = int(n_log)
        self.limits = limits or {}  # model → R∞ logged in its rows (default: the Gaussian closed form)
        runs = [initial_parameters(self.base_seed, s.seed, task.token_dim, dtype=self.dtype, device=device) for s in specs]
        self.stack = stacked.RunStack.from_parameters(runs, [s.model == "softmax" for s in specs])
        self.step = 0
        self.status = ["ok"] * len(specs)
        self.rows: list[list[dict]] = [[] for _ in specs]
        self.window: list[list[float]] = [[] for _ in specs]
        self.next_log = [0] * len(specs)  # index j of the next grid time T·j/n_log to log
        self._due: dict[int, tuple[int, int]] = {}  # run → (next_log, the first step whose clock reaches that grid time)
        self._streams = {j: [r for r, s in enumerate(specs) if s.stream == j] for j in sorted({s.stream for s in specs})}
        self._plans: dict[tuple[int, ...], stacked.Plan] = {}  # runs stepped together → the machine's plan for them

    def key(self, extra: dict) -> str:
        """What determines the trajectories: settings, runs and every step size (hashed)."""
        digest = hashlib.sha256(b"".join(s.tobytes() for s in self.step_sizes)).hexdigest()
        return json.dumps({"specs": [s.__dict__ for s in self.specs], "L": self.L, "seed": self.base_seed,
                           "batch": self.batch_size, "n_log": self.n_log, "threshold": self.threshold,
                           "dtype": str(self.dtype), "steps": digest, **extra}, sort_keys=True)

    @property
    def total_steps(self) -> int:
        return max(len(s) for s in self.step_sizes)

    def state(self, key: str) -> dict:
        stack = {n: getattr(self.stack, n).detach().cpu().clone() for n in ("Q", "K", "V", "O")}
        return {"key": key, "step": self.step, "stack": stack, "status": list(self.status), "rows": self.rows,
                "window": self.window, "next_log": list(self.next_log)}

    def restore(self, state: dict) -> None:
        for name, value in state["stack"].items():
            setattr(self.stack, name, value.to(self.device))
        self.step, self.status, self.rows = state["step"], state["status"], state["rows"]
        self.window, self.next_log = state["window"], state["next_log"]

    def active(self, r: int) -> bool:
        return self.status[r] == "ok" and self.step < len(self.step_sizes[r])

    def _log_due(self, r: int) -> bool:
        """Whether run r's clock has passed its next grid time (or it has just finished or diverged)."""
        if self.step == len(self.step_sizes[r]) and self.status[r] == "ok":
            return not self.rows[r] or self.rows[r][-1]["step"] != self.step  # the final step is always logged
        if self.next_log[r] > self.n_log:
            return False
        return self.step >= self._due_step(r)

    def _due_step(self, r: int) -> int:
        """The first step k whose clock t_k reaches run r's next grid time (its last step if none does): the clock
        never decreases, so ``t_step ≥ grid`` is ``step ≥ k`` (cached until the run logs)."""
        j = self.next_log[r]
        if self._due.get(r, (None,))[0] != j:
            grid = self.horizon * j / self.n_log
            k = int(np.searchsorted(self.clocks[r], grid * (1 - 1e-12), side="left"))
            self._due[r] = (j, min(k, len(self.step_sizes[r])))
        return self._due[r][1]

    def log(self, runs: list[int], test_set) -> None:
        """Append one row per run in ``runs`` (the test loss of all of them in one pass)."""
        if not runs:
            return
        index = torch.tensor(runs, device=self.stack.Q.device)
        losses = test_losses(self.stack.select(index), test_set, self.batch_size)
        for r, test_loss in zip(runs, losses):
            k = min(self.step, len(self.step_sizes[r]))
            train = float(np.mean(self.window[r])) if self.window[r] else float("nan")
            self.rows[r].append(log_row(self.task, self.stack.run(r), k, float(self.clocks[r][k]), train,
                                        float(test_loss), self.status[r], self.limits.get(self.specs[r].model)))
            self.window[r] = []
            t = self.clocks[r][k]
            while self.next_log[r] <= self.n_log and self.horizon * self.next_log[r] / self.n_log <= t * (1 + 1e-12):
                self.next_log[r] += 1
            if k >= len(self.step_sizes[r]) or self.status[r] != "ok":
                self.next_log[r] = self.n_log + 1  # the run is over: no more rows

    def _schedule(self) -> tuple[int, dict[int, list[int]]]:
        """(the first step at which a run still going logs or ends, the runs still stepping per batch stream): between
        two such steps no run's log, end or membership changes (a divergence is looked at as it happens)."""
        events = [min(self._due_step(r) if self.next_log[r] <= self.n_log else len(self.step_sizes[r]),
                      len(self.step_sizes[r])) for r in range(len(self.specs)) if self.active(r)]
        stepping = {j: [r for r in members if self.active(r)] for j, members in self._streams.items()}
        return (min(events) if events else self.step), {j: runs for j, runs in stepping.items() if runs}

    def _plan(self, runs: list[int]) -> stacked.Plan:
        """The plan of a step of ``runs`` (:func:`largeprompt.icl.engine.tuning.plan_for`), looked up once per set of runs."""
        key = tuple(runs)
        if key not in self._plans:
            n_softmax = sum(self.specs[r].model == "softmax" for r in runs)
            self._plans[key] = tuning.plan_for(n_softmax, self.L, self.batch_size, self.task.token_dim, self.dtype,
                                               self.device)
        return self._plans[key]

    def advance(self, stream: int, runs: list[int]) -> list[int]:
        """One SGD step of ``runs`` (all on batch stream ``stream``); returns the runs that diverged."""
        query, prompt, target, frame = whitened_batch(self.task, self.base_seed, stream, self.step, self.batch_size,
                                                      self.L, self.dtype, self.device)
        whole = runs == list(range(len(self.specs)))  # every run of the stack: no gather and scatter
        index = None if whole else torch.tensor(runs, device=self.stack.Q.device)
        sub = self.stack if whole else self.stack.select(index)
        rates = torch.tensor([self.step_sizes[r][self.step] for r in runs], dtype=torch.float64, device="cpu")
        plan = self._plan(runs)
        stepped = stacked.native_step(sub, query, prompt, target, rates, self.threshold, frame, plan)
        loss, flags = stepped if stepped is not None else self._torch_step(sub, query, prompt, target, frame, plan, rates)
        if not whole:
            for name in ("Q", "K", "V", "O"):
                getattr(self.stack, name)[index] = getattr(sub, name)
        for r, value in zip(runs, loss.double().cpu().numpy()):
            self.window[r].append(float(value))
        return [r for r, flag in zip(runs, flags.tolist()) if flag]

    def _torch_step(self, sub: stacked.RunStack, query, prompt, target, frame, plan, rates):
        """The step of :meth:`advance` by torch (no native library, or a device): (loss, diverged), ``sub``'s weights
        replaced; a diverged run (loss not finite or above the threshold) keeps the weights at which it blew up."""
        loss, grads = stacked.loss_and_gradients(sub, query, prompt, target, plan, frame)
        values = loss.double().cpu()
        diverged = ~torch.isfinite(values) | (values > self.threshold)
        stacked.sgd_step(sub, grads, torch.where(diverged, 0.0, rates).to(dtype=self.dtype, device=self.stack.Q.device))
        return loss, diverged

    def run(self, test_set, *, checkpoint=None, checkpoint_every: int = 0, key_extra: dict | None = None,
            fatal_divergence: bool = False, progress=None) -> pd.DataFrame:
        """Train until every run has reached its horizon or diverged; the rows of all runs, in spec order."""
        key = self.key(key_extra or {})
        state = checkpoint.load(key) if checkpoint is not None else None  # e.g. largeprompt.io.checkpoints.Checkpoint
        if state is not None:
            self.restore(state)
            print(f"resumed all {len(self.specs)} runs from {checkpoint} at step {self.step}")
        bar = progress(total=self.total_steps, initial=self.step) if progress else None
        self.log([r for r in range(len(self.specs)) if self._log_due(r)], test_set)
        next_event, stepping = self._schedule()
        while stepping:
            if checkpoint is not None and checkpoint_every and self.step and self.step % checkpoint_every == 0:
                checkpoint.save(self.state(key))
            diverged = []
            for stream, runs in stepping.items():
                diverged += self.advance(stream, runs)
            if diverged:
                self._diverged(diverged, test_set, fatal_divergence)
            self.step += 1
            if diverged or self.step >= next_event:  # a run may log or end here: look at each
                self.log([r for r in range(len(self.specs)) if self._log_due(r)], test_set)
                next_event, stepping = self._schedule()
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return self.frame()

    def _diverged(self, runs: list[int], test_set, fatal: bool) -> None:
        """Freeze ``runs`` at the weights whose batch loss blew up, log them there, and go on (or raise)."""
        messages = [f"{self.specs[r].label} L={self.L}: diverged at step {self.step} (batch loss {self.window[r][-1]:.3g})"
                    for r in runs]
        for r in runs:
            self.status[r] = "diverged"
            if self.rows[r] and self.rows[r][-1]["step"] == self.step:  # just logged at this step: relabel that row
                self.rows[r][-1].update(status="diverged", train_loss=float(np.mean(self.window[r])))
                self.next_log[r] = self.n_log + 1
        self.log([r for r in runs if self.next_log[r] <= self.n_log], test_set)
        print("\n".join(messages))
        if fatal:
            raise TrainingDiverged(messages[0] + "; set train.fatal_divergence: false to record it and continue")

    def frame(self) -> pd.DataFrame:
        frames = []
        for spec, rows in zip(self.specs, self.rows):
            f = pd.DataFrame(rows)
            f.insert(0, "model", spec.model)
            f.insert(1, "prompt_length", self.L)
            f.insert(2, "seed", spec.seed)
            f.insert(3, "stream", spec.stream)
            frames.append(f)
        return pd.concat(frames, ignore_index=True)
