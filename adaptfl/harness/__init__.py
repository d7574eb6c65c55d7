"""Reproduction harness: sweeps over the in-process engine, reports, the results page."""
