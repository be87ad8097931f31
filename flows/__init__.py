"""The example flows (installed as ``flowkernel.examples.flows``); see ``flowkernel examples``."""
