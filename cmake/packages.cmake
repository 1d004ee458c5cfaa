# The packages of src/mcpp and which packages each may use: the ONE place the layering is declared (DESIGN.md).
#   mcpp_package(<name> [DEPS <package>...])
# builds src/mcpp/<name>/**/*.cpp as the library target mcpp_<name>, linked to its DEPS. A package may include its
# own headers, those of its DEPS and, transitively, whatever they may include — nothing else. scripts/
# check_layering.py reads these lines and runs before every build (the mcpp_layering target every package depends
# on): an #include "mcpp/<pkg>/..." against them fails the build, naming file, line and both packages
# (`python3 scripts/check_layering.py --graph` prints the graph). mcpp_lib links them all (the one name tests,
# apps and bench use).
#
# The order, bottom to top, and why:
#   core               Tensor, Parameter, errors, the config field tables: no package below it.
#   kernels            ops on tensors (CPU reference; the CUDA objects are added by cmake/cuda.cmake).
#   comm               communicators (device copies and reductions use kernels).
#   parallel_state     the parallel config and the process groups over comm.
#   tensor_parallel    TP layers and mappings over the groups.
#   transformer        the model's config and layers, transformer/moe included (experts are MLPs).
#   models             GPTModel: registers its parameters through core's ParameterRegistry.
#   pipeline_parallel  schedules over model chunks (models).
#   distributed        DDP config, the param-and-grad buffers (ModelChunk owns a GPTModel's), grad reduction.
#   optimizer          Adam, the distributed optimizer over distributed's buffers, the LR schedule.
#   dist_checkpointing sharded checkpoints and HF conversion (the model config's fields; the HF key mapping walks
#                      the model's own parameter list, models/gpt/gpt_model_tensors.h).
#   datasets           indexed datasets, blends, tokenizers and the data config: needs only core.
#   tools              planners and trace analysis: the memory planner reads the model, parallel layout,
#                      pipeline schedules and optimizer state sizes. Below training, because the trainer checks
#                      its memory plan before allocating and reports the planned activations, and its timeline
#                      reuses the trace summary; the planner takes tools::PlanConfig, which training's Config
#                      converts to, so tools never needs training.
#   training           the combined Config, arguments, trainer, checkpointing glue: everything above.
# apps/ (the CLI) may use every package; no package may use apps/.
mcpp_package(core)
mcpp_package(kernels            DEPS core)
mcpp_package(comm               DEPS kernels)
mcpp_package(parallel_state     DEPS comm)
mcpp_package(tensor_parallel    DEPS parallel_state)
mcpp_package(transformer        DEPS tensor_parallel)
mcpp_package(models             DEPS transformer)
mcpp_package(pipeline_parallel  DEPS models)
mcpp_package(distributed        DEPS models)
mcpp_package(optimizer          DEPS distributed)
mcpp_package(dist_checkpointing DEPS models)
mcpp_package(datasets           DEPS core)
mcpp_package(tools              DEPS optimizer pipeline_parallel)
mcpp_package(training           DEPS tools dist_checkpointing datasets)
