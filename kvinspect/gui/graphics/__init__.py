"""pyqtgraph items of the lanes and report figures, one item kind per file: curve, heatmap, axes, regions, lines, markers, legend."""
