"""Builds the C extensions; all other metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rdc._native._chunker",
            sources=[
                "rdc/_native/_chunker.c",
                "rdc/_native/chunker_impl.c",
                "rdc/_native/chunker_scan.c",
                "rdc/_native/chunker_x86.c",
            ],
            depends=[
                "rdc/_native/chunker_impl.h",
                "rdc/_native/chunker_scan.h",
                "rdc/_native/le_bytes.h",
            ],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._signature",
            sources=["rdc/_native/_signature.c", "rdc/_native/signature_impl.c"],
            depends=["rdc/_native/signature_impl.h", "rdc/_native/le_bytes.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._blake3",
            sources=[
                "rdc/_native/_blake3.c",
                "rdc/_native/blake3_impl.c",
                "rdc/_native/blake3_x86.c",
            ],
            depends=[
                "rdc/_native/blake3_impl.h",
                "rdc/_native/blake3_lanes.h",
                "rdc/_native/blake3_kernel.h",
            ],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._sign",
            sources=[
                "rdc/_native/_sign.c",
                "rdc/_native/chunker_impl.c",
                "rdc/_native/chunker_scan.c",
                "rdc/_native/chunker_x86.c",
                "rdc/_native/blake3_impl.c",
                "rdc/_native/blake3_x86.c",
                "rdc/_native/signature_impl.c",
            ],
            depends=[
                "rdc/_native/beneath.h",
                "rdc/_native/blake3_impl.h",
                "rdc/_native/chunker_impl.h",
                "rdc/_native/chunker_scan.h",
                "rdc/_native/signature_impl.h",
                "rdc/_native/le_bytes.h",
                "rdc/_native/seen.h",
            ],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._refine",
            sources=["rdc/_native/_refine.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._setsketch",
            sources=["rdc/_native/_setsketch.c"],
            depends=["rdc/_native/le_bytes.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._listing",
            sources=[
                "rdc/_native/_listing.c",
                "rdc/_native/blake3_impl.c",
                "rdc/_native/blake3_x86.c",
            ],
            depends=["rdc/_native/blake3_impl.h", "rdc/_native/listing_read.h",
                     "rdc/_native/stamp_entry.h"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._temps",
            sources=["rdc/_native/_temps.c"],
            depends=["rdc/_native/seen.h"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._entries",
            sources=[
                "rdc/_native/_entries.c",
                "rdc/_native/blake3_impl.c",
                "rdc/_native/blake3_x86.c",
            ],
            depends=["rdc/_native/blake3_impl.h", "rdc/_native/listing_read.h",
                     "rdc/_native/stamp_entry.h"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra"],
        ),
        Extension(
            "rdc._native._meta",
            sources=["rdc/_native/_meta.c"],
            depends=["rdc/_native/seen.h"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra"],
        ),
    ]
)
