"""Prompt templates for built-ins whose checkpoint carries none.

Gemma 3 270M is a base model: it has no chat turns to follow, only text to continue. A plain
transcript ("User: …", "Assistant: …" paragraphs after one framing line) is text it has seen
plenty of, so it continues the Assistant's paragraph. The generation prompt ends with
``Assistant:`` and no space: the model's first token carries the space, and history renders
the kept reply right after the colon, so a re-render tokenises exactly as it was generated.
``{{ bos_token }}`` is written by the template because kvinspect tokenises rendered prompts
without special tokens, and Gemma degrades badly without its BOS.

The same text is in resources/templates/transcript.jinja, for ``--chat-template``.
"""

from __future__ import annotations

#: Newlines are written as ``{{ "\n\n" }}`` expressions: transformers renders with trim_blocks, which
#: would eat a literal newline right after a block tag.
TRANSCRIPT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\\n\\n' }}"
    "{% else %}"
    "{{ 'A conversation between a curious User and a knowledgeable Assistant, "
    "who answers in clear, full paragraphs.\\n\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant:' + message['content'] + '\\n\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
