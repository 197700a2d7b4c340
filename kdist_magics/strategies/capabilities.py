"""Which strategy honours which ``%%kdist`` option: one table.

An option means the same under every strategy that accepts it. Where a strategy cannot
honour an option, :func:`kdist_magics.spec.validate` refuses the line with a UsageError
naming the option and the strategy, before anything runs; an option is never accepted and
ignored. ``tests/test_options_everywhere.py`` goes through every option of
:data:`kdist_magics.spec.OPTIONS` and every strategy of :data:`kdist_magics.spec.KINDS` and
checks each pair against this table: accepted pairs must be listed here with the test
(``file::function``) that proves them, refused pairs must not. A new option or strategy fails that test until it
is declared here (or refused in ``spec.validate``).
"""

from __future__ import annotations

#: every strategy, in spec.KINDS's order: options the magic handles itself (the record, the
#: dashboard, event files) are honoured alike under each, so one test proves them for all
_ALL = ("default", "mirrored", "tpu", "horovod", "multiworker", "sharded")

IN_KERNEL = "test_in_kernel_options.py::test_timeout_and_checkpoint_under_"
SHARDED = "test_sharded.py::"
HVD = "test_horovod_engines.py::"
MW = "test_multiworker.py::"
MW_OPTIONS = MW + "test_push_out_all_and_checkpoint_on_both_workers"
ATTACH = {
    "horovod": HVD + "test_attach_to_a_cluster_the_user_started_and_never_stop_it",
    "multiworker": MW + "test_attach_to_a_user_started_cluster_by_id_and_never_stop_it",
    "sharded": SHARDED + "test_sharded_over_two_engine_processes_equals_one_device",
}

#: option (its ``dest`` in spec.OPTIONS) -> {strategy: the test proving it is honoured there}
HONOURED: dict[str, dict[str, str]] = {
    "np": {
        "horovod": HVD + "test_engines_are_ranks_with_warm_namespaces_threads_and_loopback_sockets",
        "multiworker": MW + "test_fit_gives_identical_weights_on_both_workers_and_pulls_the_model",
        "sharded": SHARDED + "test_sharded_over_two_engine_processes_equals_one_device",
    },
    "min_np": {"horovod": "test_horovod_elastic.py::test_fewer_ranks_left_than_min_np_stops_the_run"},
    "max_np": {"horovod": "test_horovod_elastic.py::test_an_engine_registering_mid_run_joins_at_the_next_commit"},
    "devices": {
        "mirrored": "test_mirrored.py::test_mirrored_two_logical_cpus_end_to_end",
        "sharded": IN_KERNEL + "sharded",
    },
    "mesh": {"sharded": SHARDED + "test_sharded_training_equals_one_device"},
    "timeout": {
        "default": IN_KERNEL + "default",
        "mirrored": IN_KERNEL + "mirrored",
        "tpu": IN_KERNEL + "tpu",
        "sharded": IN_KERNEL + "sharded",
        "horovod": HVD + "test_timeout_reports_busy_ranks_and_leaves_engines_usable",
        "multiworker": MW + "test_timeout_stops_every_worker_and_the_next_run_restarts_the_engines",
    },
    "push": {"horovod": HVD + "test_push_and_pull_plain_values_and_clear_errors", "multiworker": MW_OPTIONS},
    "pull": {
        "horovod": HVD + "test_push_and_pull_plain_values_and_clear_errors",
        "multiworker": MW + "test_fit_gives_identical_weights_on_both_workers_and_pulls_the_model",
    },
    "out": {"horovod": HVD + "test_output_rank0_by_default_all_prefixed_or_none", "multiworker": MW_OPTIONS},
    "checkpoint": {
        "default": IN_KERNEL + "default",
        "mirrored": IN_KERNEL + "mirrored",
        "tpu": IN_KERNEL + "tpu",
        "sharded": IN_KERNEL + "sharded",
        "horovod": HVD + "test_interrupt_stops_all_ranks_and_keeps_the_checkpoint",
        "multiworker": MW_OPTIONS,
    },
    "tensorboard": {
        name: "test_after_the_run.py::test_tensorboard_reads_every_rank_step_and_epoch_metric" for name in _ALL
    },
    "no_dashboard": {name: "test_dashboard.py::test_no_dashboard_and_no_telemetry" for name in _ALL},
    "no_telemetry": {name: "test_dashboard.py::test_no_dashboard_and_no_telemetry" for name in _ALL},
    "cluster_id": dict(ATTACH),
    # --profile and --cluster-id are one attach path (cluster.EngineCluster(cluster_id, profile))
    "profile": dict(ATTACH),
}

SLURM = "test_slurm.py::"
#: every sbatch option goes to sbatch as given (a real Slurm reads --partition and --time there)
SBATCH = {
    name: "test_slurm_words.py::test_slurm_options_go_to_sbatch_named_first_then_the_free_form_words"
    for name in ("horovod", "multiworker", "sharded")
}
HONOURED.update(
    {
        "launcher": {
            "horovod": SLURM + "test_horovod_trains_across_the_nodes_once_every_node_resolves_every_name",
            "multiworker": SLURM + "test_multiworker_trains_across_the_nodes",
            "sharded": SLURM + "test_keras_on_jax_trains_across_the_nodes",
        },
        "partition": {**SBATCH, "multiworker": SLURM + "test_a_job_slurm_refuses_is_one_line_with_slurms_reason"},
        "time": {**SBATCH, "multiworker": SLURM + "test_a_job_at_its_time_limit_is_a_named_death"},
        "account": dict(SBATCH),
        "gres": dict(SBATCH),
        "sbatch": {
            **SBATCH,
            "multiworker": SLURM + "test_multiworker_trains_across_the_nodes",
            "sharded": SLURM + "test_keras_on_jax_trains_across_the_nodes",
        },
    }
)

RAY = "test_ray.py::"
HONOURED.update(
    {
        # --launcher ray places horovod's, multiworker's and sharded's engines
        "address": {
            "horovod": RAY + "test_horovod_on_ray_stopped_and_a_rank_lost_mid_run",
            "multiworker": RAY + "test_multiworker_on_ray_trains_one_model_and_leaves_nothing_reserved",
            "sharded": RAY + "test_sharded_over_ray_trains_as_one_device",
        },
        "placement": {
            "horovod": RAY + "test_horovod_on_ray_stopped_and_a_rank_lost_mid_run",
            "multiworker": RAY + "test_a_placement_ray_cannot_satisfy_is_one_line_and_nothing_stays_reserved",
            "sharded": RAY + "test_sharded_over_ray_trains_as_one_device",
        },
    }
)

#: options handled by the magic itself, alike whatever the strategy
MAGIC_LEVEL = ("tensorboard", "no_dashboard", "no_telemetry")


def honours(strategy: str, option: str) -> bool:
    """True when ``strategy`` honours ``option`` (a ``dest`` name of spec.OPTIONS)."""
    return strategy in HONOURED.get(option, {})
