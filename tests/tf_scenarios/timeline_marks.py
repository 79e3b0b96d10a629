"""A batch_reduce on the timeline: 2 logical CPU devices, one batch of three tensors through
the host path and one through the device path (the NumPy kit), recorded into the folder given.

    python tests/tf_scenarios/timeline_marks.py FOLDER
"""

from __future__ import annotations

import sys

import numpy as np
from common import per_replica, setup


def main() -> None:
    devices = setup(2)
    import tensorflow as tf
    from collectives.adapters.tensorflow import CrossDeviceOps, kits

    from collectives import timeline

    timeline.start(sys.argv[1])
    SUM = tf.distribute.ReduceOp.SUM
    ops = CrossDeviceOps("ring")
    values = [per_replica([np.full(shape, d + 1.0, np.float32) for d in range(2)], devices)
              for shape in ((3,), (2, 5), (7,))]
    out = ops.batch_reduce(SUM, [(v, v) for v in values])
    assert float(tf.reduce_sum(out[1].values[0])) == 30.0
    device_ops = CrossDeviceOps("ring")
    device_ops._device_kit = kits.NUMPY  # the device path, with NumPy standing for the device
    device_ops.batch_reduce(SUM, [(values[0], values[0])])
    timeline.stop()
    print('{"passed": ["timeline marks"], "failed": []}')


if __name__ == "__main__":
    main()
