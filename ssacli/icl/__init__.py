"""The paper's controlled in-context-learning experiments, a stage beside training: :mod:`.train`
(the ICL training loop and its presets), :mod:`.evaluate` (error under magnitude, length and outlier
shifts), :mod:`.sweep` (the paired study runner) and :mod:`.plots`. The prompts and the model are core
(:mod:`ssacli.models.icl_task`, :mod:`ssacli.models.icl`), so diagnose reads them without this stage."""
