/* jinja_cases.h — chat templates written for tests/test_serve_req.c in the
 * styles of ChatML (with tools and think blocks), Llama 3, Mistral and
 * Gemma, plus one that exercises the rest of the subset; each with the
 * variables it is rendered with and the output Python's jinja2 3.1 gives
 * under transformers' settings (trim_blocks, lstrip_blocks, loopcontrols,
 * its tojson), or the message its raise_exception raises. */
static const char *const jinja_templates[] = {
    /* t_chatml.j */
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}{{ messages[0].content ~ '\\n\\n' }}{% endif %}{{- 'Tools you can call:\\n<tools>' }}{%- for t in tools %}{{- '\\n' ~ (t | tojson) }}{%- endfor %}{{- '\\n</tools>\\nAnswer a call as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\\n' }}\n"
        "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' ~ messages[0].content ~ '<|im_end|>\\n' }}{%- endif %}\n"
        "{%- for m in messages %}\n"
        "  {%- if m.role == 'system' and loop.first %}{% continue %}{% endif %}\n"
        "  {%- if m.role == 'assistant' %}\n"
        "    {%- set body = m.content if m.content is string else '' %}\n"
        "    {%- if '</think>' in body %}{% set body = body.split('</think>')[-1].lstrip('\\n') %}{% endif %}\n"
        "    {{- '<|im_start|>assistant\\n' ~ body }}\n"
        "    {%- for c in m.tool_calls or [] %}\n"
        "      {{- ('\\n' if body or not loop.first else '') ~ '<tool_call>\\n{\"name\": \"' ~ c.function.name ~ '\", \"arguments\": ' ~ (c.function.arguments if c.function.arguments is string else c.function.arguments | tojson) ~ '}\\n</tool_call>' }}\n"
        "    {%- endfor %}\n"
        "    {{- '<|im_end|>\\n' }}\n"
        "  {%- elif m.role == 'tool' %}\n"
        "    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{% endif %}\n"
        "    {{- '\\n<tool_response>\\n' ~ m.content ~ '\\n</tool_response>' }}\n"
        "    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{% endif %}\n"
        "  {%- else %}\n"
        "    {{- '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}\n"
        "  {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}\n"
        "",
    /* t_llama3.j */
    "{{ bos_token }}{% set sys = messages[0].content | trim if messages[0].role == 'system' else 'You are helpful.' %}\n"
        "{% set rest = messages[1:] if messages[0].role == 'system' else messages %}\n"
        "<|start_header_id|>system<|end_header_id|>\n"
        "\n"
        "{{ sys }}<|eot_id|>\n"
        "{% for m in rest %}\n"
        "    {% if m.role not in ['user', 'assistant'] %}\n"
        "        {{ raise_exception('Only user and assistant roles after the system prompt, got ' ~ m.role) }}\n"
        "    {% endif %}\n"
        "<|start_header_id|>{{ m.role }}<|end_header_id|>\n"
        "\n"
        "{{ m.content | trim }}<|eot_id|>\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}\n"
        "<|start_header_id|>assistant<|end_header_id|>\n"
        "\n"
        "{% endif %}\n"
        "",
    /* t_mistral.j */
    "{{- bos_token }}\n"
        "{%- for m in messages %}\n"
        "    {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
        "        {{- raise_exception('roles must alternate user/assistant') }}\n"
        "    {%- endif %}\n"
        "    {%- if m['role'] == 'user' %}\n"
        "        {{- '[INST] ' ~ m['content'].strip() ~ ' [/INST]' }}\n"
        "    {%- else %}\n"
        "        {{- ' ' ~ m['content'].strip() ~ eos_token }}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "",
    /* t_gemma.j */
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m.role == 'assistant' else m.role %}<start_of_turn>{{ role }}\n"
        "{{ m.content | trim }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
        "{% endif %}\n"
        "",
    /* t_kitchen.j */
    "{# comment #}\n"
        "  {% set xs = [3, 1, 2] %}\n"
        "{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% if not loop.last %},{% endif %}{% else %}none{% endfor %}\n"
        "{{ \"a\" ~ 1 ~ none ~ true }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 3 }} {{ 1.5 + 1 }} {{ 10 / 4 }}\n"
        "{{ \"Hello World\" | lower }} {{ \"x,y,,z\".split(\",\") | join(\"|\") }} {{ \"  pad \" | trim }}|{{ \"abc\"[::-1] }}{{ \"abc\"[1:] }}\n"
        "{%- for k, v in {\"b\": 1, \"a\": [1, \"s\"]}.items() %} {{ k }}={{ v | tojson }}{% endfor %}\n"
        "{{ d.get(\"q\", \"dflt\") }} {{ d.missing | default(\"D\") }} {{ \"yes\" if d.k is defined else \"no\" }} {{ d is mapping }}\n"
        "{% for m in msgs | selectattr(\"role\", \"equalto\", \"user\") %}[{{ m.content }}]{% endfor %}\n"
        "{{ msgs | map(attribute=\"role\") | join(\",\") }} {{ msgs | length }} {{ (msgs | first).role }} {{ (msgs|last)[\"role\"] }}\n"
        "{%- for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %} i{{ i }}{% endfor %}\n"
        "{{ \"a\\tb\\n\" | tojson }} {{ \"\xc3""\xa9""\" | tojson }} {{ [1, [2, {}]] | tojson }} {{ 'it''s' }} {{ \"q\\\"uote\" }}\n"
        "{%- set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %} {{ ns.n }}\n"
        "{{ \"Title case words\" | title }} {{ \"abc\".upper() }} {{ \"xay\".replace(\"a\", \"bb\") }} {{ \"abc\".startswith(\"ab\") }} {{ 3 in [1,3] }} {{ \"z\" not in \"abc\" }}\n"
        "    {%+ if true %}kept-indent{% endif %}\n"
        "{{ None }} {{ [1,'a'] }} {{ {'k': 'v'} }}\n"
        "",
    /* t_macro.j */
    "{%- macro render(m, prefix='> ', upper=false) -%}\n"
        "{{ prefix }}{{ m.content | upper if upper else m.content }}\n"
        "{%- endmacro -%}\n"
        "{%- macro count(n) %}{% if n > 0 %}{{ n }}{{ count(n - 1) }}{% endif %}{% endmacro %}\n"
        "{%- for m in messages %}{{ render(m) }}|{{ render(m, upper=true) }}|{{ render(m, '# ') }}|{{ count(loop.index) }}\n"
        "{% endfor %}\n"
        "{{- [1, 2, 3, 4] | select(\"odd\") | join(\",\") }} {{ [0, 1, 2] | reject | list | length }} {{ 9 is divisibleby 3 }} {{ -3 | abs }}\n"
        "",
};
static const struct { int tmpl; const char *vars, *want, *raises; } jinja_cases[] = {
    { 0, /* t_chatml.j */
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": null, \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nHello.\"}, {\"role\": \"user\", \"content\": \"Bye\"}]}",
      "<|im_start|>system\n"
        "Be brief.<|im_end|>\n"
        "<|im_start|>user\n"
        "Hi<|im_end|>\n"
        "<|im_start|>assistant\n"
        "Hello.<|im_end|>\n"
        "<|im_start|>user\n"
        "Bye<|im_end|>\n"
        "<|im_start|>assistant\n"
        "", NULL },
    { 0, /* t_chatml.j */
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}], \"messages\": [{\"role\": \"user\", \"content\": \"Weather in Oslo?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 3}\"}, {\"role\": \"tool\", \"content\": \"ok\"}], \"enable_thinking\": false}",
      "<|im_start|>system\n"
        "Tools you can call:\n"
        "<tools>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n"
        "</tools>\n"
        "Answer a call as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\n"
        "<|im_start|>user\n"
        "Weather in Oslo?<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "{\"temp\": 3}\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "ok\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "\n"
        "</think>\n"
        "\n"
        "", NULL },
    { 1, /* t_llama3.j */
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": null, \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nHello.\"}, {\"role\": \"user\", \"content\": \"Bye\"}]}",
      "<s><|start_header_id|>system<|end_header_id|>\n"
        "\n"
        "Be brief.<|eot_id|>\n"
        "<|start_header_id|>user<|end_header_id|>\n"
        "\n"
        "Hi<|eot_id|>\n"
        "<|start_header_id|>assistant<|end_header_id|>\n"
        "\n"
        "<think>\n"
        "hm\n"
        "</think>\n"
        "\n"
        "Hello.<|eot_id|>\n"
        "<|start_header_id|>user<|end_header_id|>\n"
        "\n"
        "Bye<|eot_id|>\n"
        "<|start_header_id|>assistant<|end_header_id|>\n"
        "\n"
        "", NULL },
    { 1, /* t_llama3.j */
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}], \"messages\": [{\"role\": \"user\", \"content\": \"Weather in Oslo?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 3}\"}, {\"role\": \"tool\", \"content\": \"ok\"}], \"enable_thinking\": false}",
      NULL, "Only user and assistant roles after the system prompt, got tool" },
    { 2, /* t_mistral.j */
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": null, \"messages\": [{\"role\": \"user\", \"content\": \" a \"}, {\"role\": \"user\", \"content\": \"b\"}]}",
      NULL, "roles must alternate user/assistant" },
    { 2, /* t_mistral.j */
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": null, \"messages\": [{\"role\": \"user\", \"content\": \" a \"}, {\"role\": \"assistant\", \"content\": \"b \"}, {\"role\": \"user\", \"content\": \"c\"}]}",
      "<s>[INST] a [/INST] b</s>[INST] c [/INST]", NULL },
    { 3, /* t_gemma.j */
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": null, \"messages\": [{\"role\": \"user\", \"content\": \" a \"}, {\"role\": \"assistant\", \"content\": \"b \"}, {\"role\": \"user\", \"content\": \"c\"}]}",
      "<s><start_of_turn>user\n"
        "a<end_of_turn>\n"
        "<start_of_turn>model\n"
        "b<end_of_turn>\n"
        "<start_of_turn>user\n"
        "c<end_of_turn>\n"
        "<start_of_turn>model\n"
        "", NULL },
    { 4, /* t_kitchen.j */
      "{\"d\": {\"k\": 1, \"q\": null}, \"msgs\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u1\"}, {\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"u2\"}]}",
      "1/2:3,2/2:2a1NoneTrue 3 2 8 2.5 2.5\n"
        "hello world x|y||z pad|cbabc b=1 a=[1, \"s\"]None D yes True\n"
        "[u1][u2]system,user,assistant,user 4 system user i0 i2\"a\\tb\\n\" \"\xc3""\xa9""\" [1, [2, {}]] its q\"uote 6\n"
        "Title Case Words ABC xbby True True True\n"
        "    kept-indentNone [1, 'a'] {'k': 'v'}", NULL },
    { 5, /* t_macro.j */
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"tools\": null, \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nHello.\"}, {\"role\": \"user\", \"content\": \"Bye\"}]}",
      "> Be brief.|> BE BRIEF.|# Be brief.|1\n"
        "> Hi|> HI|# Hi|21\n"
        "> <think>\n"
        "hm\n"
        "</think>\n"
        "\n"
        "Hello.|> <THINK>\n"
        "HM\n"
        "</THINK>\n"
        "\n"
        "HELLO.|# <think>\n"
        "hm\n"
        "</think>\n"
        "\n"
        "Hello.|321\n"
        "> Bye|> BYE|# Bye|4321\n"
        "1,3 1 True 3", NULL },
};
