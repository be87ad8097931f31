"""Flow files on disk: reading them, confining the paths they name, the child flows they call, and remembering which passed validation; imports core/ and errors only."""
