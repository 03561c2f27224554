"""Message query: IDs, the per-segment key and tag indexes, SQL92 selectors, and searches."""
