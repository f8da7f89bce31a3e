"""The plots widget and its lanes on one step axis: the cache heatmap, the tokens lane, the memory lane."""
