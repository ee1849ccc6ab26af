"""`shoal export RUN`: a run's trained model, out of its checkpoint, in the files its users
load without shoal.

A checkpoint holds what a resume needs (the optimizer's state, the schedule, every rank's
RNG) in the layout the run trained in (state.pt, or DCP's pieces for a sharded run). An
export is the model alone, whole, under the names of the user's own module:

- `source.py`: which checkpoint (best, latest, a step, a folder), verified as a resume
  verifies it, its model read whole in this process (DCP read without a process group);
- `model.py`: the run's model rebuilt from its factory on the meta device (no weights),
  for its names, its tied weights and, for a Hugging Face model, its config and class;
- `write.py`: one safetensors file, or a folder `from_pretrained` loads, written into a
  temporary path and renamed into place.
"""

from shoal.export.run import Exported, export_run

__all__ = ["Exported", "export_run"]
