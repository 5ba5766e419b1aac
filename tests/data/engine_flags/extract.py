"""How the flag lists beside this file were made: each engine's own source, read without
importing it (no engine is installed here). One line per flag: the flag and SWITCH (no value),
VALUE (one word) or MANY (argparse nargs='+'); llama-server's lines mark VALUE only.

  pip download --no-deps --no-binary :all: vllm==0.11.0      # the sdist; stop it once downloaded
  python extract.py vllm VLLM_SRC/vllm > vllm-0.11.0.txt
  pip download --no-deps sglang==0.5.3                        # a pure-Python wheel; unzip it
  python extract.py sglang SGLANG/sglang/srt/server_args.py > sglang-0.5.3.txt
  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
  python extract.py llama LCP/vendor/llama.cpp/common/arg.cpp > llama-server.txt
"""

import ast
import re
import sys


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            lits = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                    and a.value.startswith("-")]
            yield node, lits


def _annotations(tree, cls):
    return {st.target.id: ast.unparse(st.annotation) for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and node.name == cls
            for st in node.body if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}


def _is_bool(a):
    return a in ("bool", "Optional[bool]", "bool | None")


def _is_many(a):
    return bool(re.match(r"(Optional\[)?(list|tuple)\[", a)) or "Union[str,list" in a.replace(" ", "").replace("\n", "")


def vllm(root):
    """engine/arg_utils.py's add_argument literals (EngineArgs: bools are BooleanOptionalAction,
    lists nargs='+'), and entrypoints/openai/cli_args.py's FrontendArgs fields."""
    ea = ast.parse(open(f"{root}/engine/arg_utils.py").read())
    ca = ast.parse(open(f"{root}/entrypoints/openai/cli_args.py").read())
    eng, front = _annotations(ea, "EngineArgs"), _annotations(ca, "FrontendArgs")
    kinds = {}
    for tree in (ea, ca):
        for node, lits in _calls(tree):
            for l in lits:
                kinds.setdefault(l, "VALUE")
            for kw in node.keywords:
                src = ast.unparse(kw.value)
                if kw.arg == "action" and ("store_true" in src or "BooleanOptional" in src):
                    kinds.update({l: "SWITCH" for l in lits})
                    if "BooleanOptional" in src:
                        kinds.update({"--no-" + l[2:]: "SWITCH" for l in lits if l.startswith("--")})
                if kw.arg == "nargs":
                    kinds.update({l: "MANY" for l in lits})
                if kw.arg is None and isinstance(kw.value, ast.Subscript) and isinstance(kw.value.slice, ast.Constant):
                    a = front.get(kw.value.slice.value, "") or eng.get(kw.value.slice.value, "")
                    if _is_bool(a):
                        kinds.update({l: "SWITCH" for l in lits})
                        kinds.update({"--no-" + l[2:]: "SWITCH" for l in lits if l.startswith("--")})
                    elif _is_many(a):
                        kinds.update({l: "MANY" for l in lits})
    special = {"allowed_origins", "allowed_methods", "allowed_headers", "middleware"}  # nargs removed by cli_args
    for name, a in front.items():
        flag = "--" + name.replace("_", "-")
        kinds[flag] = "VALUE" if name in special else "SWITCH" if _is_bool(a) else "MANY" if _is_many(a) else "VALUE"
        if _is_bool(a):
            kinds["--no-" + flag[2:]] = "SWITCH"
    return kinds


def sglang(path):
    """srt/server_args.py's add_argument literals."""
    kinds = {}
    for node, lits in _calls(ast.parse(open(path).read())):
        kind = "VALUE"
        for kw in node.keywords:
            src = ast.unparse(kw.value)
            if kw.arg == "action" and ("store_true" in src or "store_false" in src or "BooleanOptional" in src):
                kind = "SWITCH"
                if "BooleanOptional" in src:
                    kinds.update({"--no-" + l[2:]: "SWITCH" for l in lits if l.startswith("--")})
            if kw.arg == "nargs" and src.strip("'\"") != "?":
                kind = "MANY"
        kinds.update({l: kind for l in lits})
    return kinds


def llama(path):
    """common/arg.cpp's common_arg()s whose examples include the server (or that are common),
    less those set_excludes takes from it; VALUE where the handler takes a string or an int."""
    src = open(path).read()
    starts = [m.start() for m in re.finditer(r"add_opt\(common_arg\(", src)] + [len(src)]
    kinds = {}
    for i, e in zip(starts, starts[1:]):
        blk = src[i:e]
        lists = re.findall(r"^add_opt\(common_arg\(\s*\{([^}]*)\}(?:,\s*\{([^}]*)\})?", blk)
        names = re.findall(r'"([^"]+)"', lists[0][0]) + re.findall(r'"([^"]+)"', lists[0][1]) if lists else []
        ex = re.search(r"set_examples\(\{([^}]*)\}", blk)
        exc = re.search(r"set_excludes\(\{([^}]*)\}", blk)
        examples = ex.group(1) if ex else "LLAMA_EXAMPLE_COMMON"
        if ("LLAMA_EXAMPLE_SERVER" in examples or "LLAMA_EXAMPLE_COMMON" in examples) and \
                not (exc and "LLAMA_EXAMPLE_SERVER" in exc.group(1)):
            takes = re.search(r"\[\]\(common_params\s*&\s*\w*\s*,\s*(const std::string|int)", blk)
            kinds.update({n: "VALUE" if takes else "SWITCH" for n in names if n.startswith("-")})
    return kinds


if __name__ == "__main__":
    got = {"vllm": vllm, "sglang": sglang, "llama": llama}[sys.argv[1]](sys.argv[2])
    print("\n".join(f"{f} {k}" for f, k in sorted(got.items())))
