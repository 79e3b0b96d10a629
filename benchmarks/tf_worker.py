"""TensorFlow's ``ReductionToOneDevice`` timed on request, in a process of its own.

``compare_multidevice.py`` starts this script (:class:`TfWorker`) and sends it one JSON
request per line on stdin; each answer is one JSON line on stdout. TensorFlow thus never shares the parent's
process (nor its thread pools), yet its repeats interleave with the parent's own, so a burst
of load on the machine hits both sides alike. The methods are those of ``tf_anchor.py``
("tf_r2od", "tf_r2od_batch", "tf_add_n") on ``-p`` logical CPU devices, float32 inputs of
``collectives.tools.bench``'s sweep (the same exact inputs as the library's side):

* ``{"case": i, "do": "calibrate"}``: warm up case ``i`` of the sweep; answers the calls per
  repeat of each method (enough for ``target`` seconds, as ``bench.measure``);
* ``{"case": i, "do": "time", "shift": k}``: one repeat of every method, in an order rotated
  by ``k``; answers the seconds per call of each;
* ``{"case": i, "do": "check"}``: one call of each on the exact inputs; answers the wrong
  output elements (against the exact reference) of each.

    python benchmarks/tf_worker.py -p 4 -b 4K -e 64M
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tf_anchor  # noqa: E402

from collectives.tools import bench  # noqa: E402


class Worker:
    """The TF side of one sweep: per case, its PerReplica value and its calls."""

    def __init__(self, p: int, lo: int, hi: int, target: float):
        import tensorflow as tf

        self.version = tf.__version__
        self.devices = tf_anchor.setup_devices(p)
        config = bench.BenchConfig(collective="all_reduce", algorithms=tf_anchor.METHODS,
                                   participants=p, minbytes=lo, maxbytes=hi)
        self.cases = bench.sweep(config)
        self.target = target
        self.current: tuple[int, dict, dict] | None = None

    def _calls(self, index: int) -> tuple[dict, dict]:
        if self.current is None or self.current[0] != index:
            value = tf_anchor.per_replica(self.cases[index].inputs(), self.devices)
            self.current = (index, tf_anchor.calls(value), {})
        return self.current[1], self.current[2]

    def calibrate(self, index: int) -> dict:
        calls, iters = self._calls(index)
        for name, call in calls.items():
            iters[name] = bench.measure(call, warmup=2, repeats=1, target=self.target).iters
        return {"iters": iters, "count": self.cases[index].count}

    def time(self, index: int, shift: int) -> dict:
        calls, iters = self._calls(index)
        names = list(calls)
        shift %= len(names)
        seconds = {}
        for name in names[shift:] + names[:shift]:
            call, k = calls[name], iters[name]
            start = time.perf_counter()
            for _ in range(k):
                call()
            seconds[name] = (time.perf_counter() - start) / k
        return {"seconds": seconds}

    def check(self, index: int) -> dict:
        calls, _ = self._calls(index)
        expected = bench.expected_outputs(self.cases[index])
        wrong = {}
        for name, call in calls.items():
            outputs = [t.numpy() for t in call()]
            wrong[name] = bench.count_wrong(outputs, expected[:len(outputs)])
        return {"wrong": wrong}


class TfWorker:
    """``tf_worker.py`` in a subprocess, asked one JSON line at a time."""

    def __init__(self, p: int, lo: int, hi: int):
        cmd = [sys.executable, os.path.abspath(__file__), "-p", str(p), "-b", str(lo),
               "-e", str(hi)]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.version = self._answer()["tensorflow"]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tf_worker.py exited ({self.proc.wait()}); see its stderr")
        return json.loads(line)

    def ask(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--participants", type=int, default=4)
    parser.add_argument("-b", "--minbytes", type=bench.parse_size, default="4K")
    parser.add_argument("-e", "--maxbytes", type=bench.parse_size, default="64M")
    parser.add_argument("--target", type=float, default=bench.TARGET_SECONDS)
    args = parser.parse_args(argv)
    # Answers go to the real stdout; anything TensorFlow prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    worker = Worker(args.participants, args.minbytes, args.maxbytes, args.target)
    out.write(json.dumps({"ready": True, "tensorflow": worker.version}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        do, index = request["do"], request["case"]
        if do == "calibrate":
            answer = worker.calibrate(index)
        elif do == "time":
            answer = worker.time(index, request.get("shift", 0))
        else:
            answer = worker.check(index)
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
