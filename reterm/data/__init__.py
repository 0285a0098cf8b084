"""The ReTerm-10K data pipeline: from an agent's failed runs to a Hub-ready dataset of verified recoveries.

``python -m pipeline.build --config pipeline/configs/smoke.yaml --output DIR`` from the repository root (or
``reterm data build``, or ``python -m reterm.data.build``) runs the stages below; :mod:`reterm.data.build`
has the overview and :file:`pipeline/README.md` the usage.

- :mod:`reterm.data.config` - the typed YAML config of a build.
- :mod:`reterm.data.state` - the resumable stage journal (atomic unit files, stage markers).
- :mod:`reterm.data.tasks` - the train tasks (never the evaluation split).
- :mod:`reterm.data.rollout` - stage 1: the policy as a Harbor job, trajectories read back.
- :mod:`reterm.data.failures` - stage 2: failure states of failed trials (:mod:`reterm.recovery`).
- :mod:`reterm.data.inject` - error injection: failure states from perturbed successful trajectories.
- :mod:`reterm.data.teacher` - recovery policies; the offline oracle-guided teacher.
- :mod:`reterm.data.recover` - stages 3-4: rebuild, fork N attempts, run them, verify.
- :mod:`reterm.data.replay_check` - the replay check of a record in a fresh sandbox.
- :mod:`reterm.data.filters` - stage 5: quality, duplicates, decontamination.
- :mod:`reterm.data.write`, :mod:`reterm.data.build_report` - stage 6: parquet + stats.json, report.md + PNGs.
- :mod:`reterm.data.environments` - environments outside Harbor trials (local sandbox or any Harbor type).
- :mod:`reterm.data.drills` - the recovery dataset of the recovery drills (``python -m pipeline.drills``).
- :mod:`reterm.data.layout`, :mod:`reterm.data.dataset_stats` - the published dataset folder and its ``stats.json``.
"""
