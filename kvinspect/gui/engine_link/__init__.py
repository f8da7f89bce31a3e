"""Where the window's records come from: the engine child (process, requests, session controller) and a followed trace."""
