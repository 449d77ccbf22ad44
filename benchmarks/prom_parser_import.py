"""What loading prometheus_client's text parser costs: gpuheal's way (the parser module without the
package's __init__, parse/llama_metrics._text_parser) or the public import. One fresh process a
run; prints milliseconds. Issue 19 item 6:

    for m in trick public; do for i in $(seq 9); do python benchmarks/prom_parser_import.py $m; done; done
"""
import sys
import time

mode = sys.argv[1]
t = time.perf_counter()
if mode == "trick":
    from gpuheal.parse.llama_metrics import _text_parser
    t = time.perf_counter()  # the module itself is imported by check either way
    _text_parser()
else:
    from gpuheal.parse.llama_metrics import _text_parser  # noqa
    t = time.perf_counter()
    from prometheus_client.parser import text_string_to_metric_families  # noqa
print((time.perf_counter() - t) * 1000)
