"""Starting workers: in-process, as local worker processes, or joining a torchrun job."""
