# The Debian package (`cpack -G DEB` in the build directory, or `scripts/package.sh`):
# /usr/bin/outbox-relay, the systemd unit, the example config as /etc/outbox-relay/relay.yaml
# and an environment file for secrets (both conffiles), and the docs. Runtime dependencies
# come from dpkg-shlibdeps (the shared libraries the binary links), never the -dev packages.
include(GNUInstallDirs)

install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/outbox-relay.service
        DESTINATION lib/systemd/system COMPONENT relay)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/config/relay.example.yaml
        DESTINATION /etc/outbox-relay RENAME relay.yaml COMPONENT relay)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/outbox-relay.env
        DESTINATION /etc/outbox-relay
        PERMISSIONS OWNER_READ OWNER_WRITE COMPONENT relay)
install(FILES ${PROJECT_SOURCE_DIR}/README.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT relay)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs COMPONENT relay
        FILES_MATCHING PATTERN "*.md")

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "outbox-relay")
set(CPACK_PACKAGE_VENDOR "outbox-relay")
set(CPACK_PACKAGE_CONTACT "outbox-relay maintainers <maintainers@outbox-relay.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Transactional outbox relay: PostgreSQL to Kafka and webhooks")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_DEB_COMPONENT_INSTALL OFF)
set(CPACK_COMPONENTS_ALL relay)
set(CPACK_DEBIAN_PACKAGE_SECTION "net")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_FILE_NAME "DEB-DEFAULT")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_STRIP_FILES ON)  # the build keeps -g; the package ships the stripped binary
# The files under /etc are the administrator's: an upgrade keeps their edits (dpkg conffiles).
file(WRITE ${CMAKE_BINARY_DIR}/debian/conffiles
     "/etc/outbox-relay/relay.yaml\n/etc/outbox-relay/outbox-relay.env\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "Claims committed outbox messages with SELECT ... FOR UPDATE SKIP LOCKED and delivers\n\
them to Kafka (librdkafka) or signed HTTP webhooks, with retries, dead letters, per-key\n\
order, metrics and a status command. Configure /etc/outbox-relay/relay.yaml, run\n\
`outbox-relay migrate`, then `systemctl enable --now outbox-relay`.")
include(CPack)
