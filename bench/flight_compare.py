"""Prints embedded vs Flight results of `insitu bench tpch` side by side.

Usage: flight_compare.py EMBEDDED.json FLIGHT.json
"""
import json
import sys


def main(embedded_path, flight_path):
    embedded = json.load(open(embedded_path))
    flight = json.load(open(flight_path))
    by_query = {q["query"]: q for q in embedded["queries"]}
    print(f"# TPC-H SF {embedded['scale_factor']}: embedded vs {flight['devices']} device servers "
          f"(Arrow Flight over loopback), medians of {flight['runs']} runs\n")
    print("| query | mode | embedded (s) | flight (s) | time overhead | link bytes embedded "
          "| link bytes flight | loopback bytes | wire overhead | answers match |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for f in flight["queries"]:
        e = by_query.get(f["query"])
        if e is None:
            continue
        for mode in ("push", "pull"):
            et, ft = e[mode]["median_secs"], f[mode]["median_secs"]
            eb, fb = e[mode]["link_bytes"], f[mode]["link_bytes"]
            wire = f[mode].get("loopback_bytes")
            wire_text = f"{wire:,}" if wire is not None else "n/a"
            overhead = f"{wire / max(fb, 1):.3f}x" if wire is not None else "n/a"
            print(f"| Q{f['query']} | {mode} | {et:.3f} | {ft:.3f} | {ft / et:.2f}x | {eb:,} | {fb:,} "
                  f"| {wire_text} | {overhead} | {'yes' if f['answers_match'] and e['answers_match'] else 'NO'} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
