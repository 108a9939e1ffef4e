"""`cadence serve --chat-template`: a template read from a file or given inline, refused at start when
it cannot be, rendered for the built-in vocabulary as transformers renders it for a tokenizer
directory, and served: /tokenize's chat prompt and /tokenizer_info come from it."""

from __future__ import annotations

import asyncio

import pytest
from test_tokenizer import CHAT_TEMPLATE, write_byte_level_tokenizer

from api.cli import build_parser
from api.client import AsyncClient
from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.tokenizer import load_tokenizer
from core.tokenizer.jinja_template import ChatTemplateError, JinjaChatTemplate, read_chat_template
from ipc.messages import ChatTurn, TokenizerQuery
from procs.args import launch_options_from_args
from procs.launcher import Launcher, LaunchOptions

CHATS = [
    ([{"role": "user", "content": "hi"}], {}),
    ([{"role": "user", "content": "hi"}], {"enable_thinking": False}),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
      {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}], {}),
    ([{"role": "user", "content": "q"}], {"add_generation_prompt": False}),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}],
     {"continue_final_message": True, "add_generation_prompt": False}),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], {}),
]


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory):
    return write_byte_level_tokenizer(tmp_path_factory.mktemp("template_hf"), CHAT_TEMPLATE)


@pytest.mark.parametrize("messages, options", CHATS)
def test_the_builtin_vocabulary_renders_a_template_as_transformers_does(hf_directory, messages, options):
    builtin = load_tokenizer(None)
    builtin.set_chat_template(CHAT_TEMPLATE)
    assert builtin.chat_template == CHAT_TEMPLATE
    transformers_renders = load_tokenizer(hf_directory).apply_chat_template(messages, **options)
    assert builtin.apply_chat_template(messages, **options) == transformers_renders


def test_a_tokenizer_directorys_template_gives_way_to_the_given_one(hf_directory):
    tokenizer = load_tokenizer(hf_directory)
    tokenizer.set_chat_template("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n"
    assert tokenizer.chat_template.startswith("{% for m in messages %}")
    tokenizer.set_chat_template("{{ raise_exception('no chats today') }}")
    with pytest.raises(ValueError, match="the --chat-template template rejected the messages: no chats"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_the_flag_takes_a_file_or_an_inline_template_and_refuses_anything_else(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(CHAT_TEMPLATE)
    assert read_chat_template(str(path)) == CHAT_TEMPLATE
    assert read_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    with pytest.raises(ChatTemplateError, match=r"--chat-template 'chatml' is neither a file nor a Jinja"):
        read_chat_template("chatml")
    with pytest.raises(ChatTemplateError, match=r"--chat-template does not compile: line 2: .*endfor"):
        read_chat_template("{% for m in messages %}\n{{ m.content }}")
    args = build_parser().parse_args(["serve", "--chat-template", str(tmp_path / "missing.jinja")])
    with pytest.raises(ChatTemplateError, match="missing.jinja' is neither a file nor a Jinja template"):
        launch_options_from_args(args)  # before any process starts
    args = build_parser().parse_args(["serve", "--chat-template", str(path)])
    assert launch_options_from_args(args).chat_template == CHAT_TEMPLATE


def test_a_template_that_refuses_a_chat_says_why():
    template = JinjaChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}"
                                 "{% endif %}{{ messages[0].content }}")
    assert template.render([{"role": "user", "content": "x"}]) == "x"
    with pytest.raises(ChatTemplateError, match="refused the messages: user first"):
        template.render([{"role": "system", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not hold the last message's content"):
        JinjaChatTemplate("fixed").render([{"role": "assistant", "content": "abc"}],
                                          continue_final_message=True)


def test_a_server_renders_chats_with_the_given_template():
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\nSure:{% endif %}")
    config = EngineConfig(model=ModelConfig.from_name("qwen3-tiny"), cache=CacheConfig(num_pages=64),
                          scheduler=SchedulerConfig(max_model_len=256, max_num_seqs=4,
                                                    max_num_batched_tokens=256), device="cpu")
    tokenizer = load_tokenizer(None)
    with Launcher(config, LaunchOptions(startup_timeout_s=180, chat_template=template)) as launcher:
        async def ask():
            async with AsyncClient(launcher.endpoints.tokenizer_frontend, timeout_s=30) as client:
                chat = TokenizerQuery("t", "tokenize", messages=[ChatTurn("user", "hello")])
                info = await client.ask_tokenizer(TokenizerQuery("i", "info"))
                return (await client.ask_tokenizer(chat)).body, info.body

        tokenized, info = asyncio.run(ask())
    prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nSure:"
    assert tokenizer.decode(tokenized["tokens"]) == prompt
    assert info["chat_template"] == template
