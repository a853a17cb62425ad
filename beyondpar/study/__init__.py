"""The paper's study: config -> workdir -> training -> checkpoints -> records -> report.

`train.train_and_evaluate(config, workdir)` trains one run; `ablation.run` a grid of them;
`evaluate.evaluate_tree` turns every checkpoint into a record; `report.write_report` the
records into tables and plots.
"""
