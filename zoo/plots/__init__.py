"""Pictures that explain a Transformer: position tables, learning-rate schedules, training
curves (and attention maps), drawn with matplotlib into PNG files.

`draw` holds the matplotlib helpers (a grid of heatmaps, line charts, atomic PNG files); the
other modules turn a model, a card or a training folder into panels. Nothing here is imported
by `zoo list` or `zoo show`, so they never load matplotlib (or torch).
"""
