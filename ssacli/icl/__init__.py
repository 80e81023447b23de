"""The paper's controlled in-context-learning experiments, a stage beside training: :mod:`.train`
(the ICL training loop and its presets), :mod:`.evaluate` (error under magnitude, length and outlier
shifts) and :mod:`.sweep` (the paired study, on the engine :mod:`ssacli.study`); its figures are drawn
in :mod:`ssacli.report.plots`. The prompts and the model are core
(:mod:`ssacli.models.icl_task`, :mod:`ssacli.models.icl`), so diagnose reads them without this stage."""
