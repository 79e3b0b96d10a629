"""Run TensorFlow scenario suites in this process, on N logical CPU devices.

    python tests/tf_scenarios/run.py N SUITE [SUITE ...] [--save-reference PATH]

Suites: ``fixtures`` (TensorFlow's cross-device-ops fixtures for every class; device counts 1
and 2 in a 2-device process, N otherwise), ``keras`` / ``keras-quick`` (``model.fit`` and a
custom loop against TensorFlow's ``ReductionToOneDevice``), ``threads`` (the multi-worker path
with thread workers; 4 devices), ``device`` (the device path with the NumPy kit:
``device_checks``). TensorFlow imports once and splits the CPU once, so several suites share
one process. ``SUITE@K`` runs a suite on the first K devices only, as a K-device process would
(``fixtures@2``: device counts 1 and 2; ``keras-quick@3``: its checks named "k=3 fit ...");
the fixtures' checks that do not depend on the device count run once, with the most devices.
The last line of stdout is the JSON report.
"""

from __future__ import annotations

import argparse

from common import Report, setup

SUITES = ("fixtures", "keras", "keras-quick", "threads", "device")


def suite_and_count(text: str) -> tuple[str, int | None]:
    suite, _, count = text.partition("@")
    if suite not in SUITES or (count and not count.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: a suite is one of {', '.join(SUITES)}, "
                                         "optionally @K")
    return suite, int(count) if count else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("devices", type=int)
    parser.add_argument("suites", nargs="+", type=suite_and_count,
                        help="fixtures, keras, keras-quick, threads or device; SUITE@K: on "
                             "the first K devices")
    parser.add_argument("--save-reference", help="where the keras suite saves TF's weights")
    args = parser.parse_args()
    all_devices = setup(args.devices)
    most = max((k or args.devices for suite, k in args.suites if suite == "fixtures"), default=0)
    report = Report()
    for suite, k in args.suites:
        if k is not None and not 1 <= k <= args.devices:
            parser.error(f"{suite}@{k}: the process has {args.devices} devices")
        n = k or args.devices
        devices = all_devices[:n]
        if suite == "fixtures":
            import fixtures

            counts = [1, 2] if n == 2 else [n]
            once = n == most
            fixtures.run(report, devices, counts, once=once)
            if once:  # (once per process, should two suites have the most devices)
                most = -1
        elif suite.startswith("keras"):
            import keras_fit

            keras_fit.run(report, devices, quick=suite == "keras-quick",
                          save_reference=args.save_reference if k is None else None,
                          label="" if k is None else f"k={k} ")
        elif suite == "device":
            import device_checks
            from collectives.adapters.tensorflow import kits

            device_checks.run(report, devices, kits.NUMPY, "device path:")
        else:
            import multi_worker_threads

            multi_worker_threads.run(report, devices)
    report.finish()


if __name__ == "__main__":
    main()
