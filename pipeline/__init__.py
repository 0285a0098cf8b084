"""The ReTerm-10K data pipeline: from an agent's failed runs to a Hub-ready dataset of verified recoveries.

``python -m pipeline.build --config pipeline/configs/smoke.yaml --output DIR`` (or ``reterm data build``)
runs the stages below; :mod:`pipeline.build` has the overview and :file:`pipeline/README.md` the usage.

- :mod:`pipeline.config` - the typed YAML config of a build.
- :mod:`pipeline.state` - the resumable stage journal (atomic unit files, stage markers).
- :mod:`pipeline.tasks` - the train tasks (never the evaluation split).
- :mod:`pipeline.rollout` - stage 1: the policy as a Harbor job, trajectories read back.
- :mod:`pipeline.failures` - stage 2: failure states of failed trials (:mod:`reterm.recovery`).
- :mod:`pipeline.inject` - error injection: failure states from perturbed successful trajectories.
- :mod:`pipeline.teacher` - recovery policies; the offline oracle-guided teacher.
- :mod:`pipeline.recover` - stages 3-4: rebuild, fork N attempts, run them, verify.
- :mod:`pipeline.verify` - the replay check of a record in a fresh sandbox.
- :mod:`pipeline.filters` - stage 5: quality, duplicates, decontamination.
- :mod:`pipeline.write`, :mod:`pipeline.report` - stage 6: parquet + stats.json, report.md + PNGs.
- :mod:`pipeline.environments` - environments outside Harbor trials (local sandbox or any Harbor type).
"""
