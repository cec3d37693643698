"""Experiment configs (configs/*.yaml) and the FPA vs SageBwd CPU demo (`python -m experiments.demo`)."""
