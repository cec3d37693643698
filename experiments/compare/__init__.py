"""FPA vs SageBwd from MLflow: a grid's runs as the paper's table, loss-curve figures and a
report.

`store` reads runs from MLflow into plain `records` and logs the report back; `table`
computes the numbers, `figures` draws them and `report` writes report.md; `comparison`
runs one comparison (the demo calls it), `command` is `python -m experiments compare`.
"""
