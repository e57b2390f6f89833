"""Simulation: ``fedcore simulate`` (one run on an engine, its records, summary and regret)
and sweeps over seeds."""
