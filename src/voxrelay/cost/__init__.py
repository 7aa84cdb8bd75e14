"""What a run costs: the ``cost`` config section, each session's usage (``<run>/usage.json``), and the
estimate that ``voxrelay status RUN --cost`` prints and ``cost.budget`` stops training on. Torch-free."""
