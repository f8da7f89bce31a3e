"""Images in a conversation: reading them, naming them by their pixels, and where they sit in the cache."""
