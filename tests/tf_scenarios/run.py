"""Run TensorFlow scenario suites in this process, on N logical CPU devices.

    python tests/tf_scenarios/run.py N SUITE [SUITE ...] [--save-reference PATH]

Suites: ``fixtures`` (TensorFlow's cross-device-ops fixtures for every class; device counts 1
and 2 in a 2-device process, N otherwise), ``keras`` / ``keras-quick`` (``model.fit`` and a
custom loop against TensorFlow's ``ReductionToOneDevice``), ``threads`` (the multi-worker path
with thread workers; 4 devices), ``device`` (the device path with the NumPy kit:
``device_checks``). TensorFlow imports once and splits the CPU once, so several suites share
one process. The last line of stdout is the JSON report.
"""

from __future__ import annotations

import argparse

from common import Report, setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("devices", type=int)
    parser.add_argument("suites", nargs="+",
                        choices=["fixtures", "keras", "keras-quick", "threads", "device"])
    parser.add_argument("--save-reference", help="where the keras suite saves TF's weights")
    args = parser.parse_args()
    devices = setup(args.devices)
    report = Report()
    for suite in args.suites:
        if suite == "fixtures":
            import fixtures

            counts = [1, 2] if args.devices == 2 else [args.devices]
            fixtures.run(report, devices, counts)
        elif suite.startswith("keras"):
            import keras_fit

            keras_fit.run(report, devices, quick=suite == "keras-quick",
                          save_reference=args.save_reference)
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
