// SPDX-License-Identifier: Apache-2.0
// One include for Catch2 v3 (split headers) and v2 (single header).
#pragma once
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#define FLY_CATCH_V3 1
#else
#include <catch2/catch.hpp>
#endif
