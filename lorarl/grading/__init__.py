"""How a completion is graded, shared by the reward (train, pack) and the evaluate stage, below all of them.

* :mod:`.answers`: extracting boxed / final answers and gold answers;
* :mod:`.verify`: math-verify grading in a timed worker pool (``GradingSettings``, ``score_math_batch``);
* :mod:`.answer_formats`: the formats of ``reward.answer_format``: text rules (DAPO's ``Answer:`` line, ...) and
  answer spans (the recipe's ``<answer>``) that math-verify and the letter grader read;
* :mod:`.hendrycks_math`: Evalchemy's grader (hendrycks-MATH's last box and ``is_equiv``; format ``hendrycks_boxed``);
* :mod:`.choice`: multiple-choice letters (inside a format's answer span first);
* :mod:`.option_text`: an answer span holding an option's text matched to the problem's choices;
* :mod:`.protocols`: greedy pass@1, avg@k, unbiased pass@k, Wilson intervals, ``Protocol``;
* :mod:`.benchmarks`: the benchmark registry (hub or local loaders, templates, graders);
* :mod:`.overrides`: the answer formats and math-verify settings a study may write (``GradingOverride``);
* :mod:`.resolve`: a cell's ``eval:`` section checked against the registry (what lorarl.language.config validates with).

Nothing here imports torch, transformers or a lorarl stage.
"""
