"""Read models of what runs did, folded from their logs or read from the store: summaries, conversations, agent runs, lineage; knows no node type."""
