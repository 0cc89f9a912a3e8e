# SPDX-License-Identifier: Apache-2.0
# CPACK_PRE_BUILD_SCRIPTS: after cpack stages the files, before it packs them. In a DEB the
# prefix is /usr for good (a package is never moved), so its flykernels.pc says prefix=/usr and
# pkg-config prints clean paths (-lflykernels, no .../pkgconfig/../../.. segments). The TGZ and
# `cmake --install` keep the ${pcfiledir}-relative prefix: pkg-config does not normalize paths,
# so a tree that can be moved cannot avoid the `..` segments (docs/install.md).
if(CPACK_GENERATOR STREQUAL "DEB")
  file(GLOB_RECURSE pcs "${CPACK_TEMPORARY_DIRECTORY}/*/flykernels.pc")
  foreach(pc IN LISTS pcs)
    file(READ "${pc}" text)
    string(REGEX REPLACE "\nprefix=[^\n]*" "\nprefix=/usr" text "${text}")
    string(REPLACE "# Relocatable: prefix is found from this file's own place (pcfiledir), so a moved or unpacked tree works."
                   "# Installed by the DEB: prefix /usr." text "${text}")
    file(WRITE "${pc}" "${text}")
  endforeach()
endif()
