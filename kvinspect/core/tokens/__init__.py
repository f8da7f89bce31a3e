"""The token view's model: the ids a trace recorded and where each token stands in the cache at a step."""
