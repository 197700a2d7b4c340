"""kdist_magics: distributed Keras training from one notebook cell.

``%load_ext kdist_magics`` registers ``%%kdist`` and ``%kdist``. Loading imports
neither TensorFlow, Keras nor Horovod: every heavy import happens when a cell
actually needs it.
"""

__version__ = "0.1.0"

__all__ = ["load_ipython_extension", "unload_ipython_extension", "last_run", "last_scale", "__version__"]

# The one piece of module state: the magics instance registered with the shell.
_extension = None


def load_ipython_extension(ipython):
    """Register the magics with ``ipython`` (called by ``%load_ext``)."""
    global _extension
    from .magics import KDist

    if _extension is not None and _extension.shell is ipython:
        return
    _extension = KDist(shell=ipython)
    ipython.register_magics(_extension)
    from .strategies.multiworker.run_script import help_lines

    if help_lines not in ipython.input_transformers_cleanup:  # %kdist run? shows its usage
        ipython.input_transformers_cleanup.append(help_lines)
    from .watch.tf_logs import quiet_tensorflow_imports

    extension = _extension  # TensorFlow's C++ start-up lines, unless KDist.tf_info_logs
    quiet_tensorflow_imports(lambda: not extension.tf_info_logs)


def unload_ipython_extension(ipython):
    """Stop what the extension started (engines, rendezvous) and forget it."""
    global _extension
    if _extension is None:
        return
    _extension.close()
    from .errors import quiet_cell_failed

    quiet_cell_failed(ipython, install=False)
    from .strategies.multiworker.run_script import help_lines

    if help_lines in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(help_lines)
    from .watch.tf_logs import quiet_tensorflow_imports

    quiet_tensorflow_imports(None, install=False)
    _extension = None


def last_run():
    """The :class:`~kdist_magics.watch.record.RunRecord` of the latest ``%%kdist`` run, or None."""
    if _extension is None:
        return None
    return _extension.last_record


def last_scale():
    """The :class:`~kdist_magics.scale.table.ScaleTable` of the latest ``%kdist scale``, or None:
    one row per N (samples/s, speed-up, efficiency, the step's split, measured or predicted)."""
    if _extension is None:
        return None
    return _extension.last_scale
