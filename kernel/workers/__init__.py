"""Workers: claim queued and orphaned runs from the store and execute them through the Kernel; their defaults."""
