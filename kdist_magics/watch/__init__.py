"""Watching a run: its record, telemetry, and every view of it.

:mod:`.record` is one run's record (``last_run()``); :mod:`.telemetry` (the Keras callback,
reading the collective's time through :mod:`.collective`) and :mod:`.sampling` (utilisation)
produce its rows (and :mod:`.step_probe` ``%kdist scale``'s timed steps), :mod:`.stragglers`
and :mod:`.split` read them;
:mod:`.dashboard` is the live widget (front end in ``static/``), :mod:`.offline` what it
becomes when the run ends, :mod:`.svg` the static summary inside that,
:mod:`.plot` the matplotlib view after the run, :mod:`.axes` their shared chart rules;
:mod:`.tensorboard` writes event files and :mod:`.tf_logs` quiets TensorFlow's INFO lines;
:mod:`.compat_jax` and :mod:`.compat_colab` bridge JAX's and Colab's versions.
"""
