"""A small builder of synthetic Kineto GPU traces with known answers."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field


@dataclass
class Builder:
    pid: int = 100
    main_tid: int = 1
    bwd_tid: int = 2
    device: int = 0
    events: list = field(default_factory=list)
    _ext: int = 1
    _corr: int = 1000
    device_properties: list = field(default_factory=lambda: [
        {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85031714816, "computeMajor": 9, "computeMinor": 0, "numSms": 132}
    ])
    distributed: dict | None = None

    def op(self, name, ts, dur, tid=None, cat="cpu_op", **args):
        a = {"External id": self._ext}
        self._ext += 1
        a.update(args)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid or self.main_tid, "ts": ts, "dur": dur, "args": a})
        return a["External id"]

    def annotation(self, name, ts, dur, tid=None):
        return self.op(name, ts, dur, tid=tid, cat="user_annotation")

    def kernel(self, name, launch_ts, start, dur, stream=7, tid=None, launch="cudaLaunchKernel", cat="kernel", **kargs):
        """A runtime launch on the host thread and its device activity, linked by correlation."""
        corr = self._corr
        self._corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": self.pid, "tid": tid or self.main_tid, "ts": launch_ts, "dur": 2.0, "args": {"correlation": corr}})
        args = {"device": self.device, "stream": stream, "correlation": corr}
        args.update(kargs)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": stream, "ts": start, "dur": dur, "args": args})
        return corr

    def doc(self):
        d = {"schemaVersion": 1, "deviceProperties": self.device_properties, "traceEvents": self.events}
        if self.distributed:
            d["distributedInfo"] = self.distributed
        return d

    def write(self, path, gz=True):
        data = json.dumps(self.doc()).encode()
        if gz:
            with gzip.open(path, "wb") as f:
                f.write(data)
        else:
            with open(path, "wb") as f:
                f.write(data)
        return str(path)
