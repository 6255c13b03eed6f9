"""A run directory's provenance: where a run lives and who owns it, what makes it the run it is, its seals, and
where and with what a continuation resumes.

``run_dir`` makes, checks and reopens a run directory (``resume_point``: the round a continued run resumes from);
``run_lock`` is its one owner; ``run_identity`` the identity its marker and checkpoints record, sealed with the key
of ``checkpoint_key`` (``run_seal``: the config that defines the run, rayfed's version, its code's digests);
``plugin_seal`` the code a continuation may run (compared by :mod:`rayfed.util.plugin_check`), ``trace_seal`` the
trace files it may read, and ``resume_config`` the config ``rayfed run --resume`` opens, as its seal allows.
Nothing here trains or imports torch.
"""
