"""A real Slurm on this machine, for the tests: munge, slurmctld and two slurmd "nodes".

The nodes are the network-namespace "hosts" the netns tests build (:class:`test_netns.Hosts`:
a bridge, two namespaces with their own address; here their hostnames are the node names).
slurmctld runs in the root namespace on the bridge address; each slurmd runs inside its
namespace with a hostname of its own (``nsenter --net`` then ``unshare --uts``: ``ip netns
exec`` would remount /sys, and slurmd then fails on cgroups), ``slurmd -N NODE``, so a job's
tasks see that node's hostname and address, as on a real cluster. Node names are added to
/etc/hosts (a marked block, removed again): Gloo and TensorFlow resolve hostnames.

Everything lives in a temporary folder: slurm.conf, munge's key, socket and logs, the state
and spool folders. ``SLURM_CONF`` points Slurm's commands there; the fixture sets it in
``os.environ`` while it runs (kernels and engines started then inherit it).

Configuration (Slurm 22.05, Debian's ``slurm-wlm``): ``proctrack/linuxproc``,
``task/none``, ``select/cons_tres``, no accounting, root as SlurmUser; two partitions, ``kd``
(the default, both nodes, at most 60 minutes a job; a job over a partition's limits is refused
at submission, ``EnforcePartLimits=ALL``, as many sites do) and ``kdheld`` (State=DOWN: a job sent there stays PENDING, reason PartitionDown,
for the queue tests). Needs root and the packages; :func:`unavailable` says why not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from kdist_magics.cluster.lifetime import process_tree
from test_netns import HOSTS, Hosts, _kill, _run, netns_unavailable

NODES = tuple(HOSTS)  # the namespaces' hostnames are the node names
HELD = "kdheld"  # a partition whose jobs stay PENDING (State=INACTIVE)
MARK = "# kdist slurm test nodes"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "scancel", "nsenter")


def unavailable() -> str | None:
    """Why a Slurm cannot be started here (None when it can)."""
    if why := netns_unavailable():
        return why
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed (Debian: apt-get install slurm-wlm munge; "
            f"scripts/setup.sh --browser does it as root)"
        )
    return None


def without_marked_block(hosts: str) -> str:
    """``hosts`` without the block of node names a Slurm of these tests added."""
    lines, inside = [], False
    for line in hosts.splitlines(True):
        if line.strip() == MARK:
            inside = True
        elif inside and line.strip() == MARK + " end":
            inside = False
        elif not inside:
            lines.append(line)
    return "".join(lines)


def without_name(hosts: str, name: str) -> str:
    """``hosts`` without any line that names ``name``."""
    return "".join(line for line in hosts.splitlines(True) if name not in line.split("#")[0].split()[1:])


def _conf(folder: Path, bridge_ip: str, addresses: dict[str, str]) -> str:
    nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs=2 State=UNKNOWN" for n, a in addresses.items())
    names = ",".join(addresses)
    return f"""ClusterName=kdist
SlurmctldHost={socket.gethostname()}({bridge_ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
SlurmctldPort={6817}
SlurmdPort={6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=60
SchedulerType=sched/backfill
{nodes}
EnforcePartLimits=ALL
PartitionName=kd Nodes={names} Default=YES MaxTime=60 State=UP OverSubscribe=YES
PartitionName={HELD} Nodes={names} MaxTime=INFINITE State=DOWN
"""


class Slurm:
    """munged, slurmctld and the slurmd nodes, in a temporary folder, on :class:`Hosts`' bridge."""

    def __init__(self):
        self.hosts = Hosts()
        self.folder = Path(tempfile.mkdtemp(prefix="kdist-slurm-"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.etc_hosts: str | None = None  # /etc/hosts as it was
        self.env_before: str | None = os.environ.get("SLURM_CONF")

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def start(self) -> "Slurm":
        self.hosts.build()
        folder = self.folder
        (folder / "state").mkdir()
        self.conf.write_text(_conf(folder, self.hosts.bridge_ip, self.hosts.addresses))
        self._add_hosts()
        key = folder / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "--force",
                f"--socket={folder}/munge.socket",
                f"--key-file={key}",
                f"--pid-file={folder}/munged.pid",
                f"--log-file={folder}/munged.log",
                f"--seed-file={folder}/munge.seed",
            ],
        )
        self._wait(lambda: (folder / "munge.socket").exists(), "munged's socket")
        os.environ["SLURM_CONF"] = str(self.conf)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        for node in NODES:
            script = f"hostname {node} && exec slurmd -D -N {node}"
            self._spawn(
                node,
                ["nsenter", f"--net=/run/netns/{self.hosts.namespaces[node]}", "unshare", "--uts", "sh", "-c", script],
            )
        self._wait(lambda: self.idle() == set(NODES), "both nodes idle in sinfo", timeout=60)
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.folder / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, SLURM_CONF=str(self.conf))
        )
        log.close()

    def _wait(self, ok, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            ended = [n for n, p in self.procs.items() if p.poll() is not None]
            if ended or time.monotonic() > deadline:
                raise RuntimeError(f"Slurm did not come up ({what}; ended: {ended}):\n" + self.logs())
            time.sleep(0.3)

    def idle(self) -> set[str]:
        out = _run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
        return {line.split()[0] for line in out.splitlines() if line.split()[1:] == ["idle"]}

    def queue(self, job: str | None = None) -> list[str]:
        """Jobs Slurm still has that are not finished: ``JOBID STATE`` lines."""
        argv = ["squeue", "-h", "-o", "%i %T"] + (["-j", job] if job else [])
        out = _run(*argv, check=False).stdout
        return [line for line in out.splitlines() if line.strip()]

    def logs(self) -> str:
        out = []
        for path in sorted(self.folder.glob("*.log")) + sorted(self.folder.glob("*.out")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(out)

    # -- /etc/hosts --------------------------------------------------------------
    def _add_hosts(self) -> None:
        path = Path("/etc/hosts")
        # a run killed before its teardown leaves its block: with it, a node's name would still
        # resolve (to that run's address) while a test takes this run's line out
        self.etc_hosts = without_marked_block(path.read_text())
        lines = [MARK] + [f"{a} {n}" for n, a in self.hosts.addresses.items()] + [MARK + " end"]
        path.write_text(self.etc_hosts.rstrip("\n") + "\n" + "\n".join(lines) + "\n")

    @contextlib.contextmanager
    def unresolvable(self, node: str):
        """While inside: no line of /etc/hosts names ``node`` (its name resolves nowhere)."""
        path = Path("/etc/hosts")
        with_it = path.read_text()
        path.write_text(without_name(with_it, node))
        try:
            yield
        finally:
            path.write_text(with_it)

    def _restore_hosts(self) -> None:
        if self.etc_hosts is not None:
            Path("/etc/hosts").write_text(self.etc_hosts)
            self.etc_hosts = None

    # -- teardown ----------------------------------------------------------------
    def stop(self) -> None:
        """Every job cancelled, every process ended, the network and /etc/hosts as they were."""
        try:
            if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
                _run("scancel", "--full", "-u", "root", check=False)
            _kill(process_tree({p.pid for p in self.procs.values() if p.poll() is None}))
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:  # pragma: no cover
                    pass
        finally:
            self._restore_hosts()
            self.hosts.destroy()
            if self.env_before is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self.env_before
            shutil.rmtree(self.folder, ignore_errors=True)
