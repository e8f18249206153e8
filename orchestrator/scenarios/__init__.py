"""The shipped scenario files (``*.toml``) and the hook scripts some of them run (``hooks``)."""
