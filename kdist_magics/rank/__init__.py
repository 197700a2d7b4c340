"""What runs on a rank (one engine process each) and what crosses back to the kernel.

:mod:`.lifecycle` prepares a rank and begins and ends its run; :mod:`.feed` carries its
telemetry rows to the kernel over IOPub; :mod:`.values` moves ``--push``/``--pull`` values
and a cell's last value; :mod:`.faults` is the phase barrier tests inject faults at;
:mod:`.gather` makes a model sharded over processes whole before it is saved or pulled.
Importable without TensorFlow.
"""
