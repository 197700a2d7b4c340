"""The cluster and its processes: ipyparallel engines as the ranks' processes.

:mod:`.cluster` starts or attaches to a cluster and stops it (one start, whose steps a
launcher's cluster overrides), :mod:`.launch` how its processes are launched; :mod:`.liveness` and
:mod:`.exits` watch its processes end; :mod:`.lifetime` and :mod:`.follow` make them end with
the kernel; :mod:`.namespace` and :mod:`.peers` keep its loopback private to this user;
:mod:`.placement` says which engine is which rank and sees which GPU, :mod:`.priority` keeps
kdist's helpers below the ranks, :mod:`.network` picks addresses and ports,
:mod:`.compat_ipyparallel` and
:mod:`.compat_psutil` hold the workarounds for ipyparallel's internals and psutil's
versions. A new way to start engines (a launcher) goes here:
:mod:`.slurm_engines` (``--launcher slurm``: the engines as one Slurm job) over :mod:`.slurm`
(``sbatch``, ``squeue``, ``scancel``), :mod:`.ray_engines` (``--launcher ray``) over
:mod:`.ray_actors`. Horovod's rendezvous and its host-name check are Horovod's
(:mod:`kdist_magics.strategies.horovod`).
"""
