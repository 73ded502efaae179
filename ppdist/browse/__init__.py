"""``tools/browse_dataset.py``'s work: a split's samples as the model sees them, drawn and counted.

Above the components (it builds datasets, transforms and the post-process's characters from a
config) and below the tools; the drawing itself is ``ppdist.visualize``'s."""
