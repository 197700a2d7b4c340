"""``--launcher slurm`` without a Slurm (fast tier): the options, what kdist submits, and how it
reads Slurm's answers. tests/test_slurm.py runs the same against a real slurmctld."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from kdist_magics.cluster import slurm
from kdist_magics.messages import slurm_ended
from kdist_magics.spec import parse_line


def test_slurm_options_go_to_sbatch_named_first_then_the_free_form_words():
    spec = parse_line(
        "--strategy horovod --np 8 --launcher slurm --partition gpu --time 1:00:00 "
        '--account lab --gres gpu:4 --sbatch "--ntasks-per-node=4 --qos short"'
    )
    assert spec.launcher == "slurm"
    assert spec.slurm.args() == [
        "--partition=gpu",
        "--time=1:00:00",
        "--account=lab",
        "--gres=gpu:4",
        "--ntasks-per-node=4",
        "--qos",
        "short",
    ]
    assert parse_line("--strategy multiworker", {"launcher": "slurm"}).slurm == slurm.SlurmOptions()
    assert parse_line("--strategy multiworker").slurm is None
    # KDist.launcher = 'slurm' is for the clusters kdist starts: attaching and kernel strategies ignore it
    assert parse_line("--strategy horovod --cluster-id x", {"launcher": "slurm"}).slurm is None
    assert parse_line("--strategy mirrored", {"launcher": "slurm"}).strategy == "mirrored"


@pytest.mark.parametrize(
    "line, words",
    [
        ("--strategy multiworker --partition gpu", "--partition applies to --launcher slurm"),
        ("--strategy mirrored --launcher slurm", "--launcher slurm starts engines"),
        ("--strategy horovod --launcher slurm --cluster-id x", "give one or the other"),
        ('--strategy horovod --launcher slurm --sbatch "--a=\'b"', "--sbatch: cannot read"),
    ],
)
def test_slurm_options_that_cannot_apply_are_usage_errors(line, words):
    with pytest.raises(UsageError, match=words):
        parse_line(line)


def test_a_refusal_is_slurms_first_error_line():
    stderr = (
        "sbatch: error: invalid partition specified: nope\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    )
    assert slurm.refusal(stderr) == "invalid partition specified: nope"
    assert slurm.refusal("") == "sbatch failed without saying why"
    # over a partition's limit, sbatch writes one line
    assert (
        slurm.refusal(
            "sbatch: error: Batch job submission failed: Requested time limit is invalid "
            "(missing or exceeds some limit)\n"
        )
        == "Requested time limit is invalid (missing or exceeds some limit)"
    )


def test_job_states_read_as_slurm_says_them():
    pending = slurm.JobState("PENDING", "Priority", "")
    assert pending.waiting and not pending.ended and pending.words() == "PENDING: Priority"
    running = slurm.JobState("RUNNING", "None", "node[1-2]")
    assert not running.waiting and not running.ended and running.words() == "RUNNING"
    assert slurm.JobState("TIMEOUT", "TimeLimit", "node1").ended
    assert slurm_ended("CANCELLED") == "the Slurm job was cancelled"
    assert slurm_ended("TIMEOUT") == "the Slurm job reached its time limit"
    assert slurm_ended("FAILED") == "the Slurm job ended (FAILED)"


def test_the_batch_script_runs_one_srun_task_per_engine(tmp_path):
    from kdist_magics.cluster.slurm_engines import SlurmEngines

    (tmp_path / "log").mkdir()
    launcher = SlurmEngines(profile_dir=str(tmp_path), cluster_id="kdist-x", sbatch_args=["--partition=gpu"])
    launcher.write_batch_script(4)
    script = open(launcher.batch_file).read()
    assert launcher.batch_file.startswith(str(tmp_path))  # not in the notebook's folder
    assert "#SBATCH --ntasks=4\n" in script and "#SBATCH --export=ALL\n" in script
    assert script.rstrip().splitlines()[-1].startswith("srun --kill-on-bad-exit=0 ")
    # ipyparallel's engine, run under kdist's module name: the leftover check knows it as kdist's
    assert script.rstrip().endswith("-m kdist_magics.cluster.slurm engine")
    # TensorFlow's C++ INFO lines off on the engines, unless the kernel's environment sets them
    assert 'export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"\n' in script
    assert launcher.find_args() == ["sbatch", "--partition=gpu", launcher.batch_file]


def test_engines_start_with_tensorflows_cpp_info_lines_off_unless_the_kernel_sets_them():
    from kdist_magics.cluster.follow import quiet_tf_cpp

    env = {}
    quiet_tf_cpp(env)
    assert env == {"TF_CPP_MIN_LOG_LEVEL": "1"}  # INFO off; warnings and errors still show
    env = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    quiet_tf_cpp(env)
    assert env == {"TF_CPP_MIN_LOG_LEVEL": "0"}  # the user's own choice stands


def test_the_slurm_tiers_hosts_file_edits_see_a_block_a_killed_run_left():
    """The Slurm tier adds its nodes' names to /etc/hosts and takes one out to test an
    unresolvable peer. A run killed before its teardown leaves its block (other addresses):
    that block is dropped at the next start, and taking a name out takes out every line naming
    it, so the name resolves nowhere (CI stop 66 failed on such a leftover)."""
    from slurm_cluster import MARK, without_marked_block, without_name

    base = "127.0.0.1 localhost\n127.0.0.1 vm\n"
    left = f"{MARK}\n10.213.113.11 kd-host-a\n10.213.113.12 kd-host-b\n{MARK} end\n"
    assert without_marked_block(base + left) == base
    assert without_marked_block(base) == base
    ours = f"{MARK}\n10.213.87.11 kd-host-a\n10.213.87.12 kd-host-b # a note\n{MARK} end\n"
    out = without_name(base + left + ours, "kd-host-b")
    assert "kd-host-b" not in out and out.count("kd-host-a") == 2 and out.count(MARK) == 4
    assert without_name("10.0.0.1 kd-host-bb\n", "kd-host-b") == "10.0.0.1 kd-host-bb\n"
