"""Standalone experiments selected by `config.experiment`.

Each module defines `check_config(config, n_local_devices)`, which raises UserError for bad
input before anything is written, and `run(config, workdir)`.
"""
