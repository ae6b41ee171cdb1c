"""Trainer callbacks: torchtriage inside Lightning and the Hugging Face ``Trainer``.

- :mod:`torchtriage.integrations.lightning`: ``TorchtriageCallback`` for ``lightning.Trainer``
  (``pip install 'torchtriage[lightning]'``);
- :mod:`torchtriage.integrations.transformers`: ``TorchtriageCallback`` for
  ``transformers.Trainer`` (``pip install 'torchtriage[transformers]'``).

Both are thin adapters over :class:`torchtriage.integrations.window.TrainerWindow`, which
profiles a steady-state window of optimizer steps and diagnoses it when training ends. This
package imports neither framework: only the adapter a user imports does, and importing
``torchtriage`` never does.
"""
