"""Device buffers and replay buffers read by column indices: not built yet."""
