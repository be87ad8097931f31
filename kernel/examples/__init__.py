"""The example flows, their plugin module and their recorded fixtures, shipped with flowkernel; imports plugins/, agents/ and errors only.

In the repository they live in ``flows/`` and ``fixtures/`` at the top level; installed, they are the
packages ``flowkernel.examples.flows`` and ``flowkernel.examples.fixtures`` (setuptools ``package-dir``).
``flowkernel examples`` lists them and ``flowkernel examples copy DIR`` writes them out
(``flowkernel.examples.catalogue``).
"""
