"""The functional trainer pieces: TrainState, optimizer, batch layout, train step, checkpoints.

The end-to-end loop lives in ``train/trainer.py``.
"""
