"""OpenTelemetry traces of runs and the logging set-up of the command line; never affects a run."""
