"""A training job's checkpoint (docs/experiments.md#training-protocol, docs/reliability.md): written atomically,
with a checksum, and trusted only when the checksum and the settings match. Plumbing: resuming gives the same bits
as never stopping, so nothing here changes a number.

The file is a header line ``largeprompt-checkpoint 1 <sha256 of the payload>`` followed by the payload (``torch.save``
of the trainer's state). A truncated or altered file fails the checksum and is reported, never loaded; training then
starts again from step 0.
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import torch

MAGIC = b"largeprompt-checkpoint 1 "


class Checkpoint:
    """The checkpoint file at ``path`` (:func:`largeprompt.io.pipeline.checkpoint_path`)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def save(self, state: dict) -> None:
        """Write ``state`` to a temporary name, fsync it, then rename it over the checkpoint: a kill leaves either
        the previous checkpoint or the new one, never a mix."""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = buffer.getvalue()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def load(self, key: str):
        """The saved state if the file exists, its checksum verifies and it was made with the same ``key`` (the
        settings and step sizes); otherwise None, saying why in the job's log."""
        if not self.path.exists():
            return None
        raw = self.path.read_bytes()
        header, _, payload = raw.partition(b"\n")
        if not header.startswith(MAGIC) or header[len(MAGIC):].decode(errors="replace") != hashlib.sha256(payload).hexdigest():
            print(f"checkpoint {self.path} is corrupt (its checksum does not match: truncated or altered); "
                  "starting from step 0")
            return None
        try:
            state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
        except Exception as exc:  # a verified file that still does not load: never trusted
            print(f"checkpoint {self.path} unreadable ({exc}); starting from step 0")
            return None
        if state.get("key") != key:
            print(f"checkpoint {self.path} was made with other settings; starting from step 0")
            return None
        return state

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
